"""The parity suite: every loop scenario through both drivers, with identical journals."""
