"""An output dataset's prefix, owned by one batch from its creation to its end.

Checking that a prefix is empty when a batch is created is not enough: two batches
created one after the other, before either writes, would both write it, and the
dataset would hold parts of both. So a batch created with ``output_dataset`` reserves
its prefix in the creation's transaction (an ``output_reservations`` row): the
reservations of batches that have not ended are read under a transaction-level
advisory lock (every API process takes the same one, so two creations cannot both
see none), and one that holds the same prefix, or one inside the other at a path
boundary (``s3://lake/out/`` and ``s3://lake/out/run-1/``), refuses the new batch:
409 ``output_in_use``, naming the batch that holds it when it is the same project's.
A batch that has ended holds nothing: its row is dropped by the next reservation, and
from then on the prefix is not empty (its parts are there), or it is free.
"""

from __future__ import annotations

from sqlalchemy import delete, func, literal, or_, select, text
from sqlalchemy.orm import Session

from jobs.core.access_tables import OutputReservation
from jobs.core.errors import Conflict, shown
from jobs.core.schema import Batch, now
from jobs.core.status import TERMINAL

# The advisory lock every reservation takes (pg_advisory_xact_lock's key: any constant
# no other lock of the service uses).
LOCK = 0x696E6671_6F757470  # "infq" "outp"


def holder(s: Session, uri: str) -> tuple[str, str, str] | None:
    """(batch id, project id, prefix) of a batch that has not ended and holds ``uri``,
    a prefix inside it or one it lies inside; None when there is none."""
    held = literal(uri)
    row = s.execute(
        select(OutputReservation.batch_id, OutputReservation.tenant_id, OutputReservation.uri)
        .join(Batch, Batch.id == OutputReservation.batch_id)
        .where(Batch.status.not_in(TERMINAL),
               or_(func.starts_with(OutputReservation.uri, held),
                   func.starts_with(held, OutputReservation.uri)))
        .limit(1)).first()
    return None if row is None else (row[0], row[1], row[2])


def reserve(s: Session, b: Batch, uri: str) -> None:
    """Reserve the prefix ``uri`` (ending in ``/``) for ``b`` (added to ``s``, not
    committed); Conflict (409 ``output_in_use``) when a batch that has not ended holds
    it or a prefix overlapping it."""
    s.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK})
    s.execute(delete(OutputReservation).where(  # those of ended batches hold nothing
        OutputReservation.batch_id.in_(
            select(Batch.id).where(Batch.id == OutputReservation.batch_id,
                                   Batch.status.in_(TERMINAL)))))
    found = holder(s, uri)
    if found is not None:
        other, tenant, prefix = found
        who = f"batch {other}" if tenant == b.tenant_id else "a batch of another project"
        same = "" if prefix == uri else f" (its prefix {shown(prefix, 200)} overlaps it)"
        raise Conflict(f"{shown(uri, 200)} is the output dataset of {who}, which has not "
                       f"ended{same}: two batches never write one prefix; name another "
                       "prefix, or wait for that batch to end", param="output_dataset.uri",
                       code="output_in_use")
    s.add(OutputReservation(batch_id=b.id, tenant_id=b.tenant_id, uri=uri, created_at=now()))
