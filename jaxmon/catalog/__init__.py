"""The catalogs: each fact jaxmon exports or reads declared once, as data: `metrics`, every family it exports;
`hardware`, every device kind it knows. They import nothing of jaxmon, so that every wing (sources, collectors,
training) reads them and none reads another for a fact."""
