"""The tokengrad Streamlit dashboard: `tokengrad dashboard [RUNS_ROOT]` serves tokengrad/app/streamlit_app.py.

Layers: streamlit_app.py routes, data.py loads (cached, keyed on file signatures), views/ wire widgets to
loaders and to the pure figure builders of tokengrad.figures. Nothing here imports torch.
"""
