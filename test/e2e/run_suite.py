"""Runs one end-to-end suite (unittest, verbose) and prints how long each
test took, class set-up included in its first test, so that what a tier
costs is in its log (test/run-all.sh).  Usage: run_suite.py test_relay"""
import sys
import time
import unittest


class TimedResult(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.timings = []
        self._last_end = time.monotonic()

    def stopTest(self, test):
        super().stopTest(test)
        now = time.monotonic()
        # From the end of the test before: a class's setUpClass counts in
        # its first test, its tearDownClass in the next class's first.
        self.timings.append((now - self._last_end, test.id()))
        self._last_end = now


def main():
    suite_name = sys.argv[1]
    tests = unittest.defaultTestLoader.discover("test/e2e", pattern=f"{suite_name}.py")
    runner = unittest.TextTestRunner(verbosity=2, resultclass=TimedResult)
    result = runner.run(tests)
    print(f"-- {suite_name}: time per test, longest first")
    for seconds, name in sorted(result.timings, reverse=True):
        print(f"   {seconds:6.0f} s  {name}")
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
