"""The partition lease TTL is checked against the tick at settings load."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.settings import OrgaSettings


def test_a_lease_ttl_not_above_three_ticks_is_refused_naming_both_and_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Renewed every third of the TTL, checked each tick: a TTL of 3 ticks or less would let a
    live coordinator's partition leases lapse. Refused, naming both settings and the fix."""
    monkeypatch.setenv("ORGA_PARTITION_LEASE_TTL_S", "1.5")
    monkeypatch.setenv("ORGA_TICK_INTERVAL_S", "0.5")
    with pytest.raises(ValidationError) as refused:
        OrgaSettings()
    said = str(refused.value)
    assert "ORGA_PARTITION_LEASE_TTL_S=1.5" in said and "ORGA_TICK_INTERVAL_S=0.5" in said
    assert "raise ORGA_PARTITION_LEASE_TTL_S above 1.5" in said
    monkeypatch.setenv("ORGA_PARTITION_LEASE_TTL_S", "1.6")
    assert OrgaSettings().partition_lease_ttl_s == 1.6
    assert OrgaSettings(tick_interval_s=0.2, partition_lease_ttl_s=3).tick_interval_s == 0.2
