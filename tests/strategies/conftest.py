from plugin_fixtures import install_plugin  # noqa: F401  (the fixture)
