"""Many tables' small reads in a few Spark jobs, and per-table driver work side by side.

A job per table costs its fixed overhead (planning, scheduling, a result stage) per table; one job
over the union of every table's scan costs quadratically instead: each task deserializes the job's
whole plan, all scans included (over 100 tables of 10k rows, 4.5 s of a job's 14.6 s of task time
went to deserializing). So the union is cut into jobs of UNION_WIDTH scans, run side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import reduce
from typing import TypeVar

from pyspark.sql import DataFrame, Row

UNION_WIDTH = 10  # scans per job
T = TypeVar("T")
R = TypeVar("R")


def map_in_threads(work: Callable[[T], R], items: list[T], threads: int) -> list[R]:
    """[work(item) for item in items], `threads` at a time: for work that waits on the JVM (Iceberg
    metadata, the driver's own reads), which Python's lock does not serialize."""
    if threads <= 1 or len(items) <= 1:
        return [work(item) for item in items]
    with ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix="dsr-each") as pool:
        return list(pool.map(work, items))


def collect_union(parts: list[DataFrame], finish: Callable[[DataFrame], DataFrame], jobs_at_once: int) -> list[Row]:
    """The rows of `finish(union of parts)`, computed over chunks of UNION_WIDTH parts, at most
    `jobs_at_once` jobs at a time. `finish` must keep each part's rows apart (group by a column that
    names the part), since parts in different chunks never meet."""
    chunks = [parts[i:i + UNION_WIDTH] for i in range(0, len(parts), UNION_WIDTH)]

    def collect(chunk: list[DataFrame]) -> list[Row]:
        return finish(reduce(DataFrame.unionByName, chunk)).collect()

    if len(chunks) <= 1:
        return [row for chunk in chunks for row in collect(chunk)]
    with ThreadPoolExecutor(min(jobs_at_once, len(chunks)), thread_name_prefix="dsr-union") as pool:
        return [row for rows in pool.map(collect, chunks) for row in rows]

