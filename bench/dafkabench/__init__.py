"""The benchmark behind bench/run.py: its roles, its cluster helper and one module a scenario (``bm_*``,
listed in scenarios.py), and the harness the tests share with it (refconsumer, postgres, impaired_link)."""
