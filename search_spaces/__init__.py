"""Config spaces of the shipped templates, one TOML file per kernel module."""
