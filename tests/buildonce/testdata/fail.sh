#!/usr/bin/env bash
echo "cannot build" >&2
exit 1
