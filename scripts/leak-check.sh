#!/usr/bin/env bash
# Fails if anything aenv creates is still around after the suite: the leak census
# (`aenv census`, src/aenv/orchestrator/census.py) over every node instance on this host:
# jail processes and cgroups, slot namespaces with their taps and nft tables, host veths,
# loop devices and mounts under the data directory, VM directories, databases of instances
# with no node and no records, snapshot staging and sandbox snapshots (--strict: a test run
# deletes what it snapshots). Zombies are not leaks: a reclaimed orphan's VMM waits for the
# host's init to reap it.
set -u
cd "$(dirname "$0")/.."
exec .venv/bin/python -m aenv.cli.main census --strict "$@"
