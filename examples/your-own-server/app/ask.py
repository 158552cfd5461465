"""Ask the server for the next token of BATCH rows: python ask.py [--batch N] [--url URL]."""

import argparse
import json
import urllib.request

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=1)
parser.add_argument("--url", default="http://127.0.0.1:8000/next-token")
args = parser.parse_args()
body = json.dumps({"inputs": [[1, 2, 3]] * args.batch}).encode()
request = urllib.request.Request(args.url, data=body, headers={"Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=600) as response:
    print(response.read().decode())
