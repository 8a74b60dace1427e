#!/usr/bin/python3
"""The application of TestRequestTrees: an HTTP/1.1 server (a thread per
connection) that answers each request with N sequential PostgreSQL queries
and M redis calls, made by the handler's own thread or, with --pool K, by
one of K worker threads the handler hands the job to through a queue.

For each request it logs one line, its own truth for the test:
    req PATH HANDLER_TID T0 T1 PG REDIS WORKER_TID
T0 is time.monotonic_ns() once the request has been read, T1 just before
the response is written (CLOCK_MONOTONIC, the clock of lattrace's records);
PG and REDIS are the calls the request made; WORKER_TID is the thread that
made them.
"""

import argparse
import http.server
import queue
import sys
import threading
import time

import psycopg2
import redis

args = None
log_lock = threading.Lock()
log_file = None
local = threading.local()


def clients():
    """This thread's own connections, made on its first use."""
    if getattr(local, "pg", None) is None:
        pg = psycopg2.connect(host=args.pg_host, port=args.pg_port, user="postgres", dbname="postgres", sslmode="disable")
        pg.autocommit = True  # no BEGIN round trip before a query
        local.pg = pg
        local.redis = redis.Redis(host=args.redis_host, port=args.redis_port)
    return local.pg, local.redis


def work(key):
    """The request's calls, one after the other: N queries, M redis calls."""
    pg, rd = clients()
    npg = nredis = 0
    cur = pg.cursor()
    for _ in range(args.n):
        cur.execute(args.query)
        cur.fetchall()
        npg += 1
    for i in range(args.m):
        if i % 2 == 0:
            rd.set(key, "v")
        else:
            rd.get(key)
        nredis += 1
    cur.close()
    return npg, nredis, threading.get_native_id()


jobs = queue.Queue()


def worker():
    clients()  # connect before any request comes
    while True:
        key, done = jobs.get()
        done.result = work(key)
        done.set()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        t0 = time.monotonic_ns()
        key = "k%d" % threading.get_native_id()
        if args.pool:
            done = threading.Event()
            jobs.put((key, done))
            done.wait()
            npg, nredis, wtid = done.result
        else:
            npg, nredis, wtid = work(key)
        t1 = time.monotonic_ns()
        line = "req %s %d %d %d %d %d %d\n" % (self.path, threading.get_native_id(), t0, t1, npg, nredis, wtid)
        with log_lock:
            log_file.write(line)
            log_file.flush()
        body = b"ok\n"
        # One write: the status line, the headers and the body.
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    def log_message(self, format, *a):
        pass


def main():
    global args, log_file
    p = argparse.ArgumentParser()
    p.add_argument("--listen", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--pg-host", required=True)
    p.add_argument("--pg-port", type=int, default=5432)
    p.add_argument("--redis-host", required=True)
    p.add_argument("--redis-port", type=int, default=6379)
    p.add_argument("--n", type=int, default=5)
    p.add_argument("--m", type=int, default=3)
    p.add_argument("--query", default="SELECT 1")
    p.add_argument("--pool", type=int, default=0)
    p.add_argument("--log", required=True)
    args = p.parse_args()
    log_file = open(args.log, "a")
    for _ in range(args.pool):
        threading.Thread(target=worker, daemon=True).start()
    srv = http.server.ThreadingHTTPServer((args.listen, args.port), Handler)
    srv.daemon_threads = True
    print("listening", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
