"""How measured figures are worded for people (fasterfs.control.report)."""
import pytest

from fasterfs.control import report

pytestmark = pytest.mark.unit  # no root, no Ray, no MinIO


@pytest.mark.parametrize("baseline_s, ours_s, said", [(1.19, 1.0, "1.19x faster"), (1.0, 1.0, "1.00x faster"),
                                                     (0.96, 1.0, "1.04x slower"), (1.0, 2.0, "2.00x slower")])
def test_a_speedup_below_one_is_said_as_slower(baseline_s, ours_s, said):
    assert report.fmt_speedup(baseline_s / ours_s) == said
