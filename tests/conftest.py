"""Shared fixtures live in one module per area, each loaded as a plugin.

Property tests draw their examples from a seed derived from each test
(``derandomize``): every run of the suite tries the same examples, so a
rare example cannot fail one run and pass the next. To search further, run
with ``HYPOTHESIS_PROFILE=explore`` (random seeds, more examples) and pin
what it finds as a test of its own.
"""

import os

from hypothesis import settings

settings.register_profile("default", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

pytest_plugins = ["fixtures_s3", "fixtures_stores", "fixtures_corpus", "fixtures_tmp", "fixtures_ray"]


def pytest_collection_modifyitems(config, items):
    """Tests marked slow run first (in their order, then the rest in theirs): under ``-n 2`` the
    jobs of several processes start early, side by side, instead of one of them ending the run alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
