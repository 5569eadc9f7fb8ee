"""Strategy plugins: built-in ones live here, third-party ones in their own packages.

Every strategy — built-in or not — is a module registered under the entry-point group
``planc.strategies`` and follows :mod:`planc.strategies.api`.
"""
