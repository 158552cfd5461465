"""The commands that look after a store: ``ls`` and ``gc``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING

from cachelib.cli.arguments import CommandError, store_url
from cachelib.cli.output import masked, print_json, print_table
from cachelib.units import human_bytes

if TYPE_CHECKING:
    from cachelib.stores import Store


def _prefix(args: argparse.Namespace) -> str:
    from cachelib.keyformat import cache_prefix, parse_cache_ref

    if args.cache:
        return cache_prefix(*parse_cache_ref(args.cache))
    return str(args.prefix or "")


def open_listed_store(args: argparse.Namespace) -> Store:
    """The store ``ls`` and ``gc`` read. A file store whose directory does not exist is an
    error there (a typo would otherwise list nothing), though a preload counts it as a miss."""
    from cachelib.stores import open_store
    from cachelib.stores.filestore import FileStore

    url = store_url(args)
    store = open_store(url)
    if isinstance(store, FileStore) and not os.path.isdir(store.root):
        raise CommandError(f"{url}: no such store (directory {store.root} does not exist)")
    return store


LS_COLUMNS = ("CACHE", "MODEL", "OPTIONS", "GPU", "CAP", "TORCH", "TRITON", "CUDA", "PY", "SIZE", "AGE")
LS_WIDE_COLUMNS = ("CACHE", "TARGET", "MODE", "GPU", "CAP", "TORCH", "TRITON", "CUDA", "PY", "SIZE", "AGE", "KEY")


def cmd_ls(args: argparse.Namespace) -> int:
    from cachelib.inventory import describe, format_age, list_bundles, options_label, target_label

    output = "json" if args.json else args.output
    now = time.time()
    with open_listed_store(args) as store:
        found = list_bundles(store, _prefix(args))
        described = [describe(store, e) if output in ("wide", "json", "yaml") else {} for e in found]
    if output == "json":
        for entry, description in zip(found, described, strict=True):
            print_json({**entry.to_dict(now), **description})
        return 0
    if output == "yaml":  # one document: the list of what -o json prints line by line
        from cachelib import yamltext

        entries = [{**e.to_dict(now), **d} for e, d in zip(found, described, strict=True)]
        print(yamltext.dump(masked(entries)), end="", flush=True)
        return 0
    rows: list[tuple[str, ...]] = [LS_WIDE_COLUMNS if output == "wide" else LS_COLUMNS]
    for e, description in zip(found, described, strict=True):
        k = e.key
        versions = (k.gpu, k.capability, k.torch, k.triton, k.cuda, k.py, human_bytes(e.size), format_age(e.age(now)))
        row: tuple[str, ...]
        if output == "wide":
            row = (f"{k.namespace}/{k.name}", target_label(description), options_label(description), *versions, str(k))
        else:
            row = (f"{k.namespace}/{k.name}", k.model, k.options, *versions)
        rows.append(row)
    print_table(rows)
    print(f"{len(found)} bundle(s), {human_bytes(sum(e.size for e in found))}", file=sys.stderr)
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from cachelib.inventory import list_bundles, parse_duration, plan_gc
    from cachelib.signing import delete_signed

    try:
        older_than = parse_duration(args.older_than) if args.older_than else None
        if args.keep == 0 and older_than is None and not args.yes and not args.dry_run:
            raise ValueError("--keep 0 without --older-than deletes every bundle: refusing without --yes")
        now = time.time()
        with open_listed_store(args) as store:
            prefix = _prefix(args)
            found = list(list_bundles(store, prefix))
            doomed = plan_gc(found, now, older_than=older_than, keep=args.keep)
            if not prefix and found and len(doomed) == len(found) and not args.yes and not args.dry_run:
                raise ValueError(f"this gc would empty the store ({len(found)} bundles): refusing without --yes "
                                 "(--dry-run lists them; --cache or --prefix limits a gc to some)")
            deleted = 0
            for entry in doomed:
                if not args.dry_run and delete_signed(store, str(entry.key)):
                    deleted += 1
                print_json(
                    {
                        "key": str(entry.key),
                        "size": entry.size,
                        "age_seconds": round(entry.age(now), 1),
                        "action": "would delete" if args.dry_run else "deleted",
                    }
                )
    except ValueError as exc:
        raise CommandError(str(exc), 2) from None
    verb = "would delete" if args.dry_run else "deleted"
    print(
        f"{verb} {len(doomed) if args.dry_run else deleted} bundle(s), {sum(e.size for e in doomed)} bytes",
        file=sys.stderr,
    )
    return 0
