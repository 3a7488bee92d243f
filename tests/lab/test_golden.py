"""Golden outputs: the engine's full results, log included, must not change by a single byte.

The digests were recorded from the engine as it was before the performance work of issue 8 (the
lab's model is unchanged since), for every mission set-up, fix and variant at its pinned seed,
some random configurations and three edge cases (one replica under a rolling deploy, in both
protocol modes; a hard stop that leaves calls unfinished). A speed-up must leave them all equal.
A deliberate change to the model changes them: print the new table with
`.venv/bin/python tests/lab/test_golden.py` and say why in the commit.

Regenerated once, deliberately, for issue 17: `peak_queue` now counts only attempts that waited
(an attempt accepted by a replica with a free slot starts at once and is no longer counted). Nothing
else in any output changed: the same run with only `peak_queue` restored gives the old digests.

Regenerated once more, deliberately: `utilisation_mean` is a `math.fsum` now. Python 3.12 made `sum`
of floats compensated, so on 3.12 and 3.13 its last bit differed in seven of these runs and they
failed there; with `fsum` every Python from 3.11 on gives these digests. Nothing else changed.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from breakwater.lab import LabConfig, generate_traffic, run

# (name, config changes from the defaults, hard stop in ms, sha256 of the JSON of `to_dict(log_limit=None)`)
GOLDEN: list[tuple[str, dict[str, object], int, str]] = [
    ("m1-affinity", {"keepalive_s": 15}, 3600000, "0a01ca4a90c732d6e3bc0bc6ea873b0f9a6c5806b1dc9bf7fd1dbd42cedd9fac"),
    (
        "m1-setup",
        {"routing": "round_robin", "keepalive_s": 15},
        3600000,
        "9ec2fe349c51bcc8439f1791239de3a9de6223c9c48a21cf17c5cf03ad5bdeaf",
    ),
    (
        "m1-shared-rr",
        {"mode": "2025-11-25/shared", "routing": "round_robin", "keepalive_s": 15},
        3600000,
        "4e9c4a209d2ded28ed0e627e19d7ebab15b15c6d00bc6e5ceb9ec262d7c9dcac",
    ),
    (
        "m1-six-rr",
        {"routing": "round_robin", "replicas": 6, "keepalive_s": 15},
        3600000,
        "cd3d76de6d99462d2758783acaf4024665643fab23eef458c7a825889f6b6fde",
    ),
    (
        "m1-stateless-rr",
        {"mode": "2026-07-28", "routing": "round_robin", "keepalive_s": 15},
        3600000,
        "96cafee4ccd7b87b37c55c5162eed174188e41dca05d859631be4c4045271db8",
    ),
    (
        "m2-idem-only",
        {"mode": "2026-07-28", "routing": "round_robin", "idempotency": True, "slow_tools": True},
        3600000,
        "e0a55c93326e3470451837fab89350c80b11610607f6a7f764ed875a78df7bbb",
    ),
    (
        "m2-k15",
        {"mode": "2026-07-28", "routing": "round_robin", "keepalive_s": 15, "slow_tools": True},
        3600000,
        "bdffaf71cd9353a989e7f0717b75e5e6ea7f81837a6add791bd38f561f4af544",
    ),
    (
        "m2-k30",
        {"mode": "2026-07-28", "routing": "round_robin", "keepalive_s": 30, "slow_tools": True},
        3600000,
        "29d1886d95652af713195a31f765065a9e34a5bff9918687447cef63fcd5fdf6",
    ),
    (
        "m2-k60",
        {"mode": "2026-07-28", "routing": "round_robin", "keepalive_s": 60, "slow_tools": True},
        3600000,
        "0fede13c40385f7545dc7c75a81977c158fb7ec4a708c40d5e385570c129a25e",
    ),
    (
        "m2-setup",
        {"mode": "2026-07-28", "routing": "round_robin", "slow_tools": True},
        3600000,
        "23eac1554e3d572d97b0323349079570076c5b9c22c4715047cfa036a96abd91",
    ),
    (
        "m2-shared",
        {"mode": "2025-11-25/shared", "routing": "round_robin", "slow_tools": True},
        3600000,
        "5708ee40c4af3bf5b7710f0ef8553d3294b6f18be316207d9c715ffb17127338",
    ),
    (
        "m2-t120",
        {"mode": "2026-07-28", "routing": "round_robin", "idle_timeout_s": 120, "slow_tools": True},
        3600000,
        "1e7c0b8cedad060286e160c4e477b733b629788f19ca3583a28fffeb72d36fe9",
    ),
    (
        "m3-idem-w30",
        {"keepalive_s": 15, "idempotency": True, "slow_tools": True, "rolling_deploy": True},
        3600000,
        "63ef3a7403adc9dff5ca520f7caf4de95a5ff1869baa0c856b255095ddc0f4d6",
    ),
    (
        "m3-setup",
        {"keepalive_s": 15, "drain_s": 10, "slow_tools": True, "rolling_deploy": True},
        3600000,
        "d5a70684319e93a7fdb9c0a1e132a568256e323b1651cc1ce98ef0ebef44d14b",
    ),
    (
        "m3-w250",
        {"keepalive_s": 15, "drain_s": 250, "slow_tools": True, "rolling_deploy": True},
        3600000,
        "2ab8f1329a8c0e2d721a9063a6691c4eeff619d19c9bb44d4d3b4b405a731270",
    ),
    (
        "m4-affinity6",
        {"replicas": 6, "keepalive_s": 15, "hot_client": True},
        3600000,
        "2d7617b63e433f263175d9e3097ddbfd412b9f06cb0e09434d920b1479899793",
    ),
    (
        "m4-memory-rr",
        {"routing": "round_robin", "keepalive_s": 15, "hot_client": True},
        3600000,
        "d13eb863d80dabe807891dee09e25879ceabb95dcd998ea641c51b83676ad4ff",
    ),
    (
        "m4-setup",
        {"keepalive_s": 15, "hot_client": True},
        3600000,
        "85dd4d17668038b90a075a83cf2cc1de0f47eb1ece642c19b73c18ff709776e5",
    ),
    (
        "m4-shared-rr2",
        {"mode": "2025-11-25/shared", "routing": "round_robin", "replicas": 2, "keepalive_s": 15, "hot_client": True},
        3600000,
        "84a2435fbad7d0588df6088514b535deb2992900a1b49fbd881aeaf7631fa90b",
    ),
    (
        "m4-stateless-rr2",
        {"mode": "2026-07-28", "routing": "round_robin", "replicas": 2, "keepalive_s": 15, "hot_client": True},
        3600000,
        "16a43eb49e2c0005fbae7be124e99ec695734d2043a7762f1d7c81d55ccf887e",
    ),
    (
        "m4-stateless-rr3",
        {"mode": "2026-07-28", "routing": "round_robin", "keepalive_s": 15, "hot_client": True},
        3600000,
        "ffe2b2b78636b02d120c9c610c8fd83d52a7625ee629bdd75688113a3ab1ce9e",
    ),
    (
        "m5-idem-only",
        {
            "mode": "2026-07-28",
            "routing": "round_robin",
            "drain_s": 20,
            "idempotency": True,
            "slow_tools": True,
            "rolling_deploy": True,
        },
        3600000,
        "c585094e5a210c26c64879259de4db04d22ef724ad511051219dce3a2ec2fc15",
    ),
    (
        "m5-k15-idem",
        {
            "mode": "2026-07-28",
            "routing": "round_robin",
            "keepalive_s": 15,
            "drain_s": 20,
            "idempotency": True,
            "slow_tools": True,
            "rolling_deploy": True,
        },
        3600000,
        "9f33f7df79a31616670ba3e2f3de677b60d3310ff6695348de13d08ca9c575f3",
    ),
    (
        "m5-k15-idem-w60",
        {
            "mode": "2026-07-28",
            "routing": "round_robin",
            "keepalive_s": 15,
            "drain_s": 60,
            "idempotency": True,
            "slow_tools": True,
            "rolling_deploy": True,
        },
        3600000,
        "980b65a388a08566bd65278098265aa42baf17c34d7daa66762966f60d607e13",
    ),
    (
        "m5-k15-only",
        {
            "mode": "2026-07-28",
            "routing": "round_robin",
            "keepalive_s": 15,
            "drain_s": 20,
            "slow_tools": True,
            "rolling_deploy": True,
        },
        3600000,
        "f5d9a59d190a6927e6e54a203e84a196488cdee69dbe290ad70b49ce2d2bdd46",
    ),
    (
        "m5-k15-w250",
        {
            "mode": "2026-07-28",
            "routing": "round_robin",
            "keepalive_s": 15,
            "drain_s": 250,
            "slow_tools": True,
            "rolling_deploy": True,
        },
        3600000,
        "149f9786796a49be3ade3c256639a3a6822d15eaf14ef195e0585e554d876c6e",
    ),
    (
        "m5-setup",
        {"mode": "2026-07-28", "routing": "round_robin", "drain_s": 20, "slow_tools": True, "rolling_deploy": True},
        3600000,
        "5dbb5c6e8bb0825ceebe487fba201efce354a5884e8314184438a03e9753e615",
    ),
    (
        "m6-setup",
        {"replicas": 4, "drain_s": 20, "slow_tools": True, "rolling_deploy": True, "hot_client": True},
        3600000,
        "f4acee19ce2b8ae42925902164565f3317d270396af90ef7d5ce6128290540be",
    ),
    (
        "m6-stateless-4",
        {
            "mode": "2026-07-28",
            "routing": "round_robin",
            "replicas": 4,
            "keepalive_s": 15,
            "drain_s": 120,
            "idempotency": True,
            "slow_tools": True,
            "rolling_deploy": True,
            "hot_client": True,
        },
        3600000,
        "2311eeca017a47c250311d0583859d639070b4d40dfb895c93672e08f0ca3951",
    ),
    (
        "m6-stateless-6",
        {
            "mode": "2026-07-28",
            "routing": "round_robin",
            "replicas": 6,
            "keepalive_s": 15,
            "drain_s": 120,
            "idempotency": True,
            "slow_tools": True,
            "rolling_deploy": True,
            "hot_client": True,
        },
        3600000,
        "d51b9b9a9a2b85a8d2a64adb10fe9d5ce8a9aaf8b692f021ef3f9ebcabcebe43",
    ),
    (
        "m6-stateless-8",
        {
            "mode": "2026-07-28",
            "routing": "round_robin",
            "replicas": 8,
            "keepalive_s": 15,
            "drain_s": 120,
            "idempotency": True,
            "slow_tools": True,
            "rolling_deploy": True,
            "hot_client": True,
        },
        3600000,
        "8932ebc5ead75d6fe53ddaa113d8593ff7832b0de830c5988675dcb2187c54a7",
    ),
    (
        "rand00",
        {
            "routing": "round_robin",
            "replicas": 2,
            "idle_timeout_s": 180,
            "drain_s": 188,
            "slow_tools": True,
            "hot_client": True,
            "seed": 709153,
        },
        3600000,
        "0c03b714497edbc6a2bf243c6e3608a70888698b99bf23aad544b3c1c31bec7d",
    ),
    (
        "rand08",
        {"idle_timeout_s": 210, "drain_s": 230, "idempotency": True, "slow_tools": True, "hot_client": True, "seed": 209874},
        3600000,
        "2e8015381d15112a3cdc0ea2108288838f9aaea2ae0e259c940ad63390fba5ad",
    ),
    (
        "rand16",
        {
            "mode": "2026-07-28",
            "routing": "round_robin",
            "replicas": 6,
            "idle_timeout_s": 95,
            "drain_s": 185,
            "idempotency": True,
            "slow_tools": True,
            "rolling_deploy": True,
            "hot_client": True,
            "seed": 218202,
        },
        3600000,
        "f5b98bf604d3a9ef71c51f5c09f569d54e291f6bf9df64145706cf9aff794615",
    ),
    (
        "rand24",
        {"routing": "round_robin", "replicas": 2, "idle_timeout_s": 165, "drain_s": 189, "hot_client": True, "seed": 994772},
        3600000,
        "f7750f0cb274b3543c205fbcc460b3bb51b3a87a59e59aeb0d8ee84ffbd7ee66",
    ),
    (
        "rand32",
        {
            "mode": "2025-11-25/shared",
            "routing": "round_robin",
            "idle_timeout_s": 35,
            "keepalive_s": 70,
            "drain_s": 121,
            "idempotency": True,
            "rolling_deploy": True,
            "hot_client": True,
            "seed": 267590,
        },
        3600000,
        "a9353b9b2c5135a22c055d083c124e006a79af0700588eabf1e6effc916e7958",
    ),
    (
        "rand40",
        {"routing": "round_robin", "idle_timeout_s": 45, "drain_s": 12, "slow_tools": True, "seed": 922197},
        3600000,
        "5f188c1345670fb8d354bfa607053ccad29eecd6dda8c3d266ac209741ff5f3b",
    ),
    (
        "rand48",
        {"mode": "2025-11-25/shared", "replicas": 1, "drain_s": 258, "idempotency": True, "slow_tools": True, "seed": 21890},
        3600000,
        "03241f38c71af254ec3abca71eb7bf9ba79752ad4c0ce180a232861e47abe469",
    ),
    (
        "rand56",
        {"mode": "2025-11-25/shared", "replicas": 8, "idle_timeout_s": 25, "drain_s": 183, "slow_tools": True, "seed": 791102},
        3600000,
        "79d7663e6a84b259ab04ff4c681fca39b875bdeee29563e9b30ac98f287d1104",
    ),
    (
        "rand64",
        {
            "mode": "2026-07-28",
            "replicas": 7,
            "idle_timeout_s": 190,
            "drain_s": 211,
            "idempotency": True,
            "rolling_deploy": True,
            "hot_client": True,
            "seed": 833847,
        },
        3600000,
        "5e09f71bbf0e506c40a13d239f94e88d312a6d13ef20506c94fbe3c0545ad4f0",
    ),
    (
        "rand72",
        {
            "mode": "2026-07-28",
            "routing": "round_robin",
            "replicas": 4,
            "idle_timeout_s": 230,
            "drain_s": 133,
            "rolling_deploy": True,
            "seed": 230018,
        },
        3600000,
        "575c9347331d82caeddd080fcef3c41f8ac43909d28bb42c7ba38df257cc4d6e",
    ),
    (
        "n1-deploy-hot",
        {"replicas": 1, "idle_timeout_s": 10, "rolling_deploy": True, "hot_client": True},
        3600000,
        "0a97745569422516d447e5713612cd7f8fb7143ba8891b6fc28854018cd2cd1c",
    ),
    (
        "n1-deploy-stateless",
        {
            "mode": "2026-07-28",
            "replicas": 1,
            "idle_timeout_s": 10,
            "slow_tools": True,
            "rolling_deploy": True,
            "hot_client": True,
        },
        3600000,
        "c46be0e138514853f20ae1614f8a80632bfd70de8e095f2484564a20336c52f4",
    ),
    (
        "hardstop",
        {"slow_tools": True, "hot_client": True},
        200000,
        "b9f307417128770bc8d33385f587037f23256f3d381541b373effb5a27201bd1",
    ),
]


def _digest(changes: dict[str, object], hard_stop_ms: int) -> str:
    config = LabConfig.from_dict(changes)
    result = run(config, generate_traffic(config.seed, config.hot_client), hard_stop_ms=hard_stop_ms)
    return hashlib.sha256(json.dumps(result.to_dict(log_limit=None)).encode()).hexdigest()


@pytest.mark.parametrize(("name", "changes", "hard_stop_ms", "digest"), GOLDEN, ids=[row[0] for row in GOLDEN])
def test_result_is_bit_for_bit_unchanged(name: str, changes: dict[str, object], hard_stop_ms: int, digest: str) -> None:
    assert _digest(changes, hard_stop_ms) == digest, f"{name}: the run's output changed"


if __name__ == "__main__":
    for name, changes, hard_stop_ms, _ in GOLDEN:
        print(f"    ({name!r}, {changes!r}, {hard_stop_ms}, {_digest(changes, hard_stop_ms)!r}),")
