"""The catalogs: each fact jaxmon exports or reads declared once, as data (`metrics`: every family). They import
nothing of jaxmon, so that every wing reads them and none reads another for a fact."""
