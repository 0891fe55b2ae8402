"""op=Adasum at 2 and 4 real MPI ranks (tests/mp/suite_adasum.py, in the shared plain job), and the NumPy reference it
is judged by."""

import numpy as np

from tests.mp.adasum_reference import adasum, adasum_pair
from tests.mpi_harness import PLAIN_JOB

ADASUM = PLAIN_JOB.add("suite_adasum.py", timeout=240)  # one job with the other plain suites


@PLAIN_JOB.driver()
def test_adasum_suite(np):
    PLAIN_JOB.run(ADASUM, np)


def test_reference_follows_the_paper():
    a, b = np.array([3.0, 0.0]), np.array([0.0, 4.0])
    np.testing.assert_allclose(adasum_pair(a, b), a + b)  # orthogonal: summed
    np.testing.assert_allclose(adasum_pair(a, 2 * a), 1.5 * a)  # parallel: (1 - 2/2) a + (1 - 2/8) 2a
    np.testing.assert_allclose(adasum_pair(np.zeros(2), b), b)  # a zero vector leaves the other as it is
    np.testing.assert_array_equal(adasum_pair(np.zeros(2), np.zeros(2)), np.zeros(2))
    np.testing.assert_allclose(adasum_pair(a, b + a * 0.5), (1 - 4.5 / 18) * a + (1 - 4.5 / 36.5) * (b + a * 0.5))
    # Ranks 0 and 1, then 2 and 3, then the two results.
    vs = [np.array([1.0, 2.0]), np.array([2.0, -1.0]), np.array([0.5, 0.5]), np.array([-1.0, 3.0])]
    np.testing.assert_allclose(adasum(vs), adasum_pair(adasum_pair(vs[0], vs[1]), adasum_pair(vs[2], vs[3])))
