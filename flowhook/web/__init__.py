"""The settings screen and run browser: server-rendered pages on the same process."""
