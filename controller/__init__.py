"""The central TauGrid controller."""
