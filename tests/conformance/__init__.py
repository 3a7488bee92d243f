"""Fixtures for the tests that meet the outside world: the conformance upstream and the npm tool install."""
