"""A benchmark lake as an S3 bucket, for the remote-storage run of scripts/bench.py.

`copy(lake)` makes `<lake>-s3/`: `staging/warehouse/`, the lake with every path re-rooted at
`s3://lake/warehouse/` (data files are hard links, as they hold no paths; metadata files,
manifest lists and manifests are rewritten, so it is the same Iceberg lake, snapshot for
snapshot), and `catalog.db` pointing at it. `S3Server(out)` serves it with s3s-fs from
`<lake>-s3/root/`, uploading the staging folder through S3 PUTs the first time (so the server
keeps ETags as for any upload). Both are made once and reused.
"""
import concurrent.futures
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time

import fastavro

BUCKET = "lake"


def copy(lake):
    lake = os.path.abspath(lake)
    out = lake + "-s3"
    if os.path.exists(os.path.join(out, ".staged")):
        return out
    shutil.rmtree(out, ignore_errors=True)
    src = os.path.join(lake, "warehouse")
    dst = os.path.join(out, "staging", "warehouse")
    old, new = "file://" + src, f"s3://{BUCKET}/warehouse"
    manifest_lists = []
    sizes = {}  # new manifest path -> its new length (manifest lists record it)
    for folder, _, files in os.walk(src):
        target = os.path.join(dst, os.path.relpath(folder, src))
        os.makedirs(target, exist_ok=True)
        for name in files:
            a, b = os.path.join(folder, name), os.path.join(target, name)
            if name.endswith(".parquet"):
                os.link(a, b)
            elif name.endswith(".json"):
                with open(a) as f:
                    text = f.read()
                with open(b, "w") as f:
                    f.write(text.replace(old, new))
            elif name.endswith(".avro") and name.startswith("snap-"):
                manifest_lists.append((a, b))
            elif name.endswith(".avro"):
                rewrite_avro(a, b, old, new)
                sizes[b.replace(dst, new, 1)] = os.path.getsize(b)
            else:
                shutil.copy(a, b)
    for a, b in manifest_lists:
        rewrite_avro(a, b, old, new, lengths=sizes)

    shutil.copy(os.path.join(lake, "catalog.db"), os.path.join(out, "catalog.db"))
    db = sqlite3.connect(os.path.join(out, "catalog.db"))
    with db:
        db.execute("UPDATE iceberg_tables SET metadata_location = replace(metadata_location, ?, ?), "
                   "previous_metadata_location = replace(previous_metadata_location, ?, ?)",
                   (old, new, old, new))
    db.close()
    open(os.path.join(out, ".staged"), "w").close()
    return out


class S3Server:
    """s3s-fs serving bucket `lake` from `<out>/root` on a free port (access key and secret
    `testing`, region us-east-1, path-style)."""

    def __init__(self, out, binary, log):
        root = os.path.join(out, "root")
        fresh = not os.path.exists(os.path.join(out, ".uploaded"))
        if fresh:
            shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root, exist_ok=True)
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", str(self.port),
                                      "--access-key", "testing", "--secret-key", "testing", root],
                                     stdout=log, stderr=log)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        if fresh:
            self.upload(os.path.join(out, "staging"))
            open(os.path.join(out, ".uploaded"), "w").close()

    def client(self):
        import boto3
        import botocore.config
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1",
                            config=botocore.config.Config(max_pool_connections=32))

    def upload(self, staging):
        s3 = self.client()
        s3.create_bucket(Bucket=BUCKET)
        files = [os.path.join(d, f) for d, _, fs in os.walk(staging) for f in fs]
        print(f"== uploading {len(files)} files to s3://{BUCKET}/", file=sys.stderr)
        put = lambda path: s3.upload_file(path, BUCKET, os.path.relpath(path, staging))
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(put, files))

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def rewrite_avro(src, dst, old, new, lengths=None):
    """Copies an Avro file with every string starting with `old` re-rooted at `new`, keeping its
    schema (with Iceberg's field ids) and header metadata; `lengths` fixes manifest_length."""
    with open(src, "rb") as f:
        reader = fastavro.reader(f)
        schema = json.loads(reader.metadata["avro.schema"])
        meta = {k: v for k, v in reader.metadata.items() if not k.startswith("avro.")}
        codec = reader.codec
        records = [swap(r, old, new) for r in reader]
    for r in records:
        if lengths and r.get("manifest_path") in lengths:
            r["manifest_length"] = lengths[r["manifest_path"]]
    with open(dst, "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(schema, _force=True), records, codec=codec, metadata=meta)


def swap(v, old, new):
    if isinstance(v, str):
        return new + v[len(old):] if v.startswith(old) else v
    if isinstance(v, dict):
        return {k: swap(x, old, new) for k, x in v.items()}
    if isinstance(v, list):
        return [swap(x, old, new) for x in v]
    return v
