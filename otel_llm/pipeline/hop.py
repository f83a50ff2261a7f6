"""`TransferHop`: one physical transfer of a request's data between two stage replicas, as the
orchestrator reports it, and the check a hop must pass to be observed."""

from __future__ import annotations

from typing import NamedTuple


class TransferHop(NamedTuple):
    """One physical transfer between two stage replicas (one chunk over the connector).

    Timestamps are ns of the pipeline's monotonic clock (the orchestrator's process), in order:
    the sender starts serializing, has submitted to the connector, the receiver starts
    receiving, has deserialized. tx = tx_end - tx_start, in flight = rx_start - tx_end,
    rx = rx_end - rx_start.
    """

    from_stage: str
    from_replica: str
    to_stage: str
    to_replica: str
    size_bytes: int
    tx_start_ns: int
    tx_end_ns: int
    rx_start_ns: int
    rx_end_ns: int


def valid_hop(hop: TransferHop) -> bool:
    return (hop.size_bytes >= 0 and hop.tx_start_ns <= hop.tx_end_ns <= hop.rx_start_ns <= hop.rx_end_ns
            and type(hop.from_stage) is type(hop.from_replica) is type(hop.to_stage) is type(hop.to_replica) is str)
