"""Celery tasks of the search index."""

from celery import shared_task

from ard import indexer


@shared_task(name="ard.tasks.index_repair_task", ignore_result=True)
def index_repair_task() -> int:
    """Index the agents whose document is missing or stale (:func:`ard.indexer.index_missing`)."""
    return indexer.index_missing()
