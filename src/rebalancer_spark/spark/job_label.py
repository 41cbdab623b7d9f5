"""The Spark job description and rebalancer properties of one batch, set on the calling
thread and put back afterwards, so that the user's later jobs on that thread do not carry a
batch's label.

::

    label = JobLabel(spark.sparkContext, "rebalancer group=g resource=r epoch=3 batch=7",
                     resource="r", epoch=3)
    label.set()        # remembers what the thread had (job description, properties)
    ...                # the batch's Spark jobs show the label in the Spark UI
    label.restore()    # the thread's previous values again (idempotent)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark import SparkContext

__all__ = ["JobLabel"]

DESCRIPTION = "spark.job.description"
RESOURCE = "spark.rebalancer.resource"
EPOCH = "spark.rebalancer.epoch"


class JobLabel:
    """One batch's label; see the module docstring. Not shared between threads."""

    def __init__(self, sc: SparkContext, description: str, *, resource: str, epoch: int) -> None:
        self._sc = sc
        self._values = {DESCRIPTION: description, RESOURCE: resource, EPOCH: str(epoch)}
        self._saved: dict[str, str | None] | None = None

    def set(self) -> None:
        """Label the thread's next Spark jobs; the first call remembers the previous values."""
        if self._saved is None:
            self._saved = {key: self._sc.getLocalProperty(key) for key in self._values}
        for key, value in self._values.items():
            self._sc.setLocalProperty(key, value)

    def restore(self) -> None:
        """Put back what the thread had before :meth:`set` (a property it did not have is
        removed). Does nothing if the label was not set or was already restored."""
        saved, self._saved = self._saved, None
        if saved is None:
            return
        for key, value in saved.items():
            # Spark removes a local property set to null (None through py4j).
            self._sc.setLocalProperty(key, value)  # type: ignore[arg-type]
