"""Unit tests of the controller's pure core."""
