# A package, so that this folder's conftest.py does not replace the top-level
# tests/conftest.py as the module "conftest" (which the other tests import).
