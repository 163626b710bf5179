"""The reply to a cohort message that carries one trained model per partition, the one place its record layout is
written (clients/numpy_mod.py, for a ``NumPyClient`` called once per partition) and read (the server:
strategies/screening.py screens each partition's model as one Flower-convention reply).

A cohort reply of ours (:class:`~fl_app.instructions.CohortReply`) carries the clients' sum, which the server can
only hold to k·C, trusting the worker to have clipped each client. A user's NumPyClient returns a trained model and
clips nothing, so its cohort's answer keeps every partition's model apart: the server computes each Δ = trained −
global itself and, under server placement, re-clips each to C, exactly as it does for the reply to a message of one
partition. The layout:

* ``partition_models`` (a ConfigRecord) names what the reply answers for: ``partition_ids``, the partitions whose
  model it carries, and ``failed_ids`` with ``failures`` (aligned), the partitions whose client failed and why;
* for each partition ``p`` of ``partition_ids``, ``arrays.p`` (an ArrayRecord) and ``metrics.p`` (a MetricRecord):
  that partition's reply in Flower's convention (:class:`~fl_app.instructions.FlowerReply`: the trained model,
  ``num-examples`` and its metrics), read as that one reply would be.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flwr.app import ConfigRecord, RecordDict

from fl_app.instructions import MalformedReply

#: The record that makes a reply one of per-partition models and names what it answers for.
PARTITION_MODELS_KEY = "partition_models"
#: The fields of that record: the partitions with a model, the partitions that failed, and why (aligned).
PARTITION_MODELS_FIELDS = ("partition_ids", "failed_ids", "failures")


def model_key(partition_id: int) -> str:
    """Where partition ``partition_id``'s trained model is (Flower's ``arrays``, per partition)."""
    return f"arrays.{partition_id}"


def metrics_key(partition_id: int) -> str:
    """Where partition ``partition_id``'s ``num-examples`` and metrics are (Flower's ``metrics``, per partition)."""
    return f"metrics.{partition_id}"


def is_partition_models_reply(content: RecordDict) -> bool:
    """Whether a reply is in this layout: it holds the record :data:`PARTITION_MODELS_KEY`."""
    return PARTITION_MODELS_KEY in content


def _whole_numbers(values: object, name: str) -> list[int]:
    """``values`` as partition ids: a list of ints (a ConfigRecord could send bools, floats, strings or bytes)."""
    if not (isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)):
        raise MalformedReply(f"per-partition models reply: '{name}' is not a list of partition ids")
    return list(values)


@dataclass
class PartitionModelsReply:
    """A cohort's answer as one Flower-convention reply per partition (module docstring): ``answers`` pairs each
    partition with its reply (a RecordDict of ``arrays`` and ``metrics``), ``failures`` each partition whose client
    failed with why. What the replies hold is not checked here: each is screened as one Flower-convention reply."""

    answers: list[tuple[int, RecordDict]]
    failures: list[tuple[int, str]] = field(default_factory=list)

    def to_record(self) -> RecordDict:
        named = ConfigRecord({
            "partition_ids": [pid for pid, _ in self.answers],
            "failed_ids": [pid for pid, _ in self.failures],
            "failures": [reason for _, reason in self.failures],
        })  # fmt: skip
        content = RecordDict({PARTITION_MODELS_KEY: named})
        for pid, answer in self.answers:
            content[model_key(pid)] = answer["arrays"]
            content[metrics_key(pid)] = answer["metrics"]
        return content

    @classmethod
    def from_record(cls, content: RecordDict) -> PartitionModelsReply:
        """Read the layout. Raises :class:`MalformedReply` when the naming record is not a ConfigRecord of exactly
        :data:`PARTITION_MODELS_FIELDS` (partition ids as ints, reasons as strings aligned with ``failed_ids``) or
        the reply holds other records than it and each named partition's ``arrays.p`` and ``metrics.p``. A partition
        named twice is read twice (the server rejects the second), as sent."""
        named = content[PARTITION_MODELS_KEY]
        if not isinstance(named, ConfigRecord) or sorted(named.keys()) != sorted(PARTITION_MODELS_FIELDS):
            raise MalformedReply(f"per-partition models reply: '{PARTITION_MODELS_KEY}' is not a ConfigRecord of "
                                 f"{', '.join(PARTITION_MODELS_FIELDS)}")  # fmt: skip
        with_models = _whole_numbers(named["partition_ids"], "partition_ids")
        failed = _whole_numbers(named["failed_ids"], "failed_ids")
        reasons = named["failures"]
        if not (isinstance(reasons, list) and len(reasons) == len(failed) and all(isinstance(r, str) for r in reasons)):
            raise MalformedReply("per-partition models reply: 'failures' are not one reason per failed partition")
        expected = {PARTITION_MODELS_KEY, *(key(pid) for pid in with_models for key in (model_key, metrics_key))}
        if set(content.keys()) != expected:
            stray = sorted(set(content.keys()) ^ expected)[:5]
            raise MalformedReply(f"per-partition models reply: records missing or not named by it: {stray}")
        answers = [
            (pid, RecordDict({"arrays": content[model_key(pid)], "metrics": content[metrics_key(pid)]}))
            for pid in with_models
        ]
        return cls(answers=answers, failures=list(zip(failed, reasons, strict=True)))
