"""The parity suite: every loop scenario through both drivers, with identical journals
(``test_parity.py``), and what only the in-process driver can show (``test_inprocess_only.py``)."""
