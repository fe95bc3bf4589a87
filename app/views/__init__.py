"""Dashboard pages (run by st.navigation from app/streamlit_app.py) and their shared widgets."""
