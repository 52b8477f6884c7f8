"""The error of a web config that cannot be used."""


class WebConfigError(ValueError):
    """The web config file cannot be used; the message names the file and the key."""
