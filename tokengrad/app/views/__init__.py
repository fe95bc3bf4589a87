"""Dashboard pages (run by st.navigation from tokengrad/app/streamlit_app.py) and their shared widgets."""
