"""Settings split by environment: base (shared), local (the README's service), test, production."""
