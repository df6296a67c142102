import pytest

# The helpers of this folder assert; rewrite them like test modules (same failure messages as before the split).
pytest.register_assert_rewrite("tests.federation.mpc.helpers")
