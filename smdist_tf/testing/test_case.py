"""``DistributedTestCase``: a ``tf.test.TestCase`` whose test methods run on several ranks."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import traceback
import unittest
from typing import Any, Callable

import tensorflow as tf

from smdist_tf.testing import job, rank_results

# Run on the ranks only, never in the launching process: set-up and tear-down may
# use collectives, which need an initialized engine.
_RANK_ONLY = ("setUp", "tearDown", "setUpClass", "tearDownClass")


class DistributedTestCase(tf.test.TestCase):
    """A ``tf.test.TestCase`` whose test methods run on ``np`` ranks.

    When a test method is called in an ordinary process (``tf.test.main()``,
    ``python -m unittest``, ``pytest``), the first call starts one ``smdistrun`` job
    of ``np`` ranks that runs every test method of the class, in the usual order,
    with ``setUpClass``/``setUp``/``tearDown``/``tearDownClass`` around them; each
    method then reports its own outcome over all ranks. On the ranks,
    ``smdist_tf.init()`` has run before ``setUpClass``. A test fails when it fails
    on any rank: the message holds each failing rank's traceback, by rank. A test
    is skipped only when every rank skipped it. Each test must end within
    ``timeout`` seconds on every rank (start-up - ``init()``, importing the module,
    ``setUpClass`` - within ``startup_timeout``); a rank that does not is stopped
    with every thread's stack on its stderr, its test fails naming it, and the
    tests after it fail as not run.

    Attributes:
        np: ranks the job runs on (default 2).
        timeout: seconds for each test on each rank (default 120).
        startup_timeout: seconds for start-up on each rank (default 120).
        env: extra environment variables for the ranks.

    The ranks import the test module by name (they get this process's
    ``sys.path``), or else from its file; code at its top level runs in every
    process, before ``init()``.
    """

    np: int = 2
    timeout: float = 120.0
    startup_timeout: float = 120.0
    env: dict[str, str] = {}
    __test__ = False  # pytest collects the subclasses, not this class where a module imports it

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__test__ = True
        cls._smdist_outcomes = None
        for name, member in list(vars(cls).items()):
            if name in _RANK_ONLY:
                setattr(cls, name, _rank_only(member))
            elif name.startswith(unittest.TestLoader.testMethodPrefix) and callable(member):
                setattr(cls, name, _distributed_test(member))

    # tf.test.TestCase's TF1 session helper is named like a test: every runner would list it as skipped.
    test_session = None

    @classmethod
    def _smdist_outcome(cls, test: str) -> tuple[rank_results.TestOutcome, job.JobResult]:
        # One job per class, started by whichever of its tests runs first.
        if cls.__dict__.get("_smdist_outcomes") is None:
            tests = unittest.TestLoader().getTestCaseNames(cls)
            module = sys.modules[cls.__module__]
            cls._smdist_outcomes = job.run_on_ranks(
                _run_tests_on_rank, (cls.__module__, getattr(module, "__file__", None), cls.__qualname__,
                                     list(tests), float(cls.timeout), float(cls.startup_timeout)),
                list(tests), cls.np, cls.timeout, cls.env)
        result = cls._smdist_outcomes
        return result.outcomes[test], result


def _rank_only(member: Any) -> Any:
    """Wraps set-up or tear-down (a plain or class method) to run only on the ranks."""
    is_classmethod = isinstance(member, classmethod)
    fn = member.__func__ if is_classmethod else member

    @functools.wraps(fn)
    def wrapper(self_or_cls: Any, *args: Any, **kwargs: Any) -> Any:
        if job.on_rank():
            return fn(self_or_cls, *args, **kwargs)
        return None

    return classmethod(wrapper) if is_classmethod else wrapper


def _distributed_test(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(self: DistributedTestCase) -> Any:
        if job.on_rank():
            return fn(self)
        cls = type(self)
        outcome, result = cls._smdist_outcome(self._testMethodName)
        message = rank_results.failure_message(self._testMethodName, outcome, cls.np, cls.timeout, result.error,
                                               result.output)
        if message:
            self.fail(message)
        if outcome.skipped and not outcome.passed:
            self.skipTest(next(iter(outcome.skipped.values())))
        return None

    return wrapper


def _format_error(err: Any) -> str:
    """The traceback from the test's own code on: unittest's and the wrapper's frames are noise."""
    etype, value, tb = err
    while tb is not None and (tb.tb_frame.f_globals.get("__name__", "").startswith("unittest")
                              or tb.tb_frame.f_code.co_filename == __file__):
        tb = tb.tb_next
    return "".join(traceback.format_exception(etype, value, tb))


class _RecordingResult(unittest.TestResult):
    """Records each test's start and outcome on this rank, and re-arms the watchdog per test."""

    def __init__(self, results_dir: str, rank: int, timeout: float, tests: list[str]):
        super().__init__()
        self.results_dir, self.rank, self.timeout, self.tests = results_dir, rank, timeout, tests

    def startTest(self, test: unittest.TestCase) -> None:
        super().startTest(test)
        job.arm_watchdog(self.timeout)
        rank_results.record(self.results_dir, self.rank, "start", test._testMethodName)

    def _end(self, test: unittest.TestCase, outcome: str, detail: str = "") -> None:
        rank_results.record(self.results_dir, self.rank, "end", test._testMethodName, outcome, detail)

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self._end(test, rank_results.PASSED)

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addFailure(test, err)
        self._end(test, rank_results.FAILED, _format_error(err))

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        super().addError(test, err)
        name = getattr(test, "_testMethodName", None)
        if name is None:  # setUpClass / tearDownClass: every test of the class failed with it
            text = _format_error(err)
            for t in self.tests:
                self._end(_Named(t), rank_results.FAILED, f"{test}:\n{text}")
            return
        self._end(test, rank_results.FAILED, _format_error(err))

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        super().addSkip(test, reason)
        self._end(test, rank_results.SKIPPED, reason)

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addExpectedFailure(test, err)
        self._end(test, rank_results.PASSED)

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        super().addUnexpectedSuccess(test)
        self._end(test, rank_results.FAILED, "unexpected success")

    def addSubTest(self, test: unittest.TestCase, subtest: unittest.TestCase, err: Any) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._end(test, rank_results.FAILED, f"{subtest}:\n" + _format_error(err))


class _Named:
    """Stands for a test that a failed setUpClass or tearDownClass took down."""

    def __init__(self, name: str):
        self._testMethodName = name


def _load_class(module_name: str, module_file: str | None, qualname: str) -> type:
    """The test class, from its module by name, or from its file for a script or a module outside sys.path."""
    module: Any = None
    if module_name != "__main__":  # on a rank, __main__ is the rank's own entry script
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            if not module_file:
                raise
    if module is None:
        # Not as "__main__": the script's `if __name__ == "__main__":` block stays off.
        spec = importlib.util.spec_from_file_location("_smdist_test_module", module_file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _run_tests_on_rank(results_dir: str, module_name: str, module_file: str | None, qualname: str,
                       tests: list[str], timeout: float, startup_timeout: float) -> None:
    """One rank: start the engine, load the class and run its tests, recording each."""
    import smdist_tf as sd  # noqa: PLC0415

    job.arm_watchdog(startup_timeout)  # init(), the test module, setUpClass
    sd.init()
    cls = _load_class(module_name, module_file, qualname)
    result = _RecordingResult(results_dir, sd.rank(), timeout, tests)
    unittest.TestSuite(cls(name) for name in tests).run(result)
    job.disarm_watchdog()
