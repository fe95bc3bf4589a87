"""Bucket analysis: each probability bucket's gradient, its norm and its share of the update (AR-Lopti,
arXiv 2505.12929, Fig. 1). `analysis` holds the tensor math, `step` a step's bucket state, `rows` the rows
it writes, `passes` the verbs a host calls around its backward passes (`st.bucket_passes`)."""
