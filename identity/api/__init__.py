"""The identity API: sessions (auth), tenants and users."""
