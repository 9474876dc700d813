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


def map_unions(parts: list[DataFrame], work: Callable[[DataFrame], R], jobs_at_once: int) -> list[R]:
    """`work` applied to the union of each chunk of UNION_WIDTH parts, at most `jobs_at_once` chunks
    at a time. Parts in different chunks never meet: `work` must keep each part's rows apart."""
    chunks = [parts[i:i + UNION_WIDTH] for i in range(0, len(parts), UNION_WIDTH)]
    return map_in_threads(lambda chunk: work(reduce(DataFrame.unionByName, chunk)), chunks, jobs_at_once)


def collect_union(parts: list[DataFrame], finish: Callable[[DataFrame], DataFrame], jobs_at_once: int) -> list[Row]:
    """The rows of `finish(union of parts)`, computed over chunks of UNION_WIDTH parts (map_unions).
    `finish` must keep each part's rows apart (group by a column that names the part)."""
    return [row for rows in map_unions(parts, lambda union: finish(union).collect(), jobs_at_once) for row in rows]
