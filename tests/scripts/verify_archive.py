"""Reads Silt's archive with pyarrow and DuckDB, outside Silt, and compares every record with
what the test produced.

usage: verify_archive.py EXPECTED.jsonl [--objects N] (--dir DIR | --s3 BUCKET/PREFIX --endpoint URL)

EXPECTED.jsonl has one object per record: topic, partition, offset, timestamp (ms), key_b64
(null for a null key), value_b64, headers [[key, value_b64], ...]. Prints "ok <records>" or
fails with the first difference.
"""
import argparse
import base64
import json
import os
import sys

import pyarrow.dataset as ds
import pyarrow.fs as pafs


def b64(v):
    return None if v is None else base64.b64encode(v).decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("expected")
    ap.add_argument("--dir")
    ap.add_argument("--s3")
    ap.add_argument("--endpoint")
    ap.add_argument("--objects", type=int, help="how many objects the archive must hold")
    args = ap.parse_args()

    if args.dir:
        fs, root = pafs.LocalFileSystem(), args.dir
    else:
        endpoint = args.endpoint.split("://", 1)
        fs = pafs.S3FileSystem(
            endpoint_override=endpoint[1],
            scheme=endpoint[0],
            access_key=os.environ["AWS_ACCESS_KEY_ID"],
            secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
            region=os.environ.get("AWS_REGION", "us-east-1"),
        )
        root = args.s3
    dataset = ds.dataset(root, filesystem=fs, format="parquet", partitioning="hive")
    if args.objects is not None and len(dataset.files) != args.objects:
        sys.exit(f"the archive holds {len(dataset.files)} objects, metadata lists {args.objects}")
    table = dataset.to_table()
    names = set(table.schema.names)
    for col in ["offset", "timestamp", "key", "value", "headers", "topic", "partition"]:
        if col not in names:
            sys.exit(f"column {col} missing from the archive schema: {table.schema}")
    ts_type = str(table.schema.field("timestamp").type)
    if ts_type != "timestamp[ms, tz=UTC]":
        sys.exit(f"timestamp column is {ts_type}, expected timestamp[ms, tz=UTC]")

    got = {}
    for row in table.to_pylist():
        k = (str(row["topic"]), int(row["partition"]), row["offset"])
        if k in got:
            sys.exit(f"record {k} is archived twice")
        ts = row["timestamp"]
        got[k] = {
            "timestamp": int(ts.timestamp() * 1000) if ts is not None else None,
            "key_b64": b64(row["key"]),
            "value_b64": b64(row["value"]),
            "headers": [[h["key"], b64(h["value"])] for h in row["headers"]],
        }

    expected = {}
    with open(args.expected) as f:
        for line in f:
            e = json.loads(line)
            expected[(e["topic"], e["partition"], e["offset"])] = {
                "timestamp": e["timestamp"],
                "key_b64": e["key_b64"],
                "value_b64": e["value_b64"],
                "headers": e["headers"],
            }
    missing = sorted(set(expected) - set(got))
    if missing:
        sys.exit(f"{len(missing)} produced records are not in the archive, first {missing[:3]}")
    extra = sorted(set(got) - set(expected))
    if extra:
        sys.exit(f"{len(extra)} archived records were never produced, first {extra[:3]}")
    for k in sorted(expected):
        if got[k] != expected[k]:
            sys.exit(f"record {k} differs: archive {got[k]} vs produced {expected[k]}")

    if args.dir:
        import duckdb

        pattern = os.path.join(args.dir, "topic=*", "*", "*.parquet")
        con = duckdb.connect()
        n = con.execute(f"select count(*) from read_parquet('{pattern}', hive_partitioning=true)").fetchone()[0]
        if n != len(expected):
            sys.exit(f"duckdb counts {n} records, expected {len(expected)}")
        first = con.execute(
            f"select min(\"offset\") from read_parquet('{pattern}', hive_partitioning=true) where partition = 0"
        ).fetchone()[0]
        if first != 0:
            sys.exit(f"duckdb: first offset of partition 0 is {first}")
    print(f"ok {len(expected)}")


if __name__ == "__main__":
    main()
