"""Update attribution: each token's exact share of an update (`shares`, one directional derivative), a
step's attribution schedule (`step`), the entropy change it makes (`entropy`) and the replay of a spiking
update without its culprit tokens (`spike_replay`)."""
