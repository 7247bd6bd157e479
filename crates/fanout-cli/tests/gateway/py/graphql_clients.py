"""Independent GraphQL clients against a fanout GraphQL route (tests/gateway/graphql_python.rs):
Python `graphql-core` (the reference implementation's port) reads the route's introspection
answer, and the `gql` client runs operations. Every request is bounded (30 s); each mode prints
one JSON line.

usage:
  python graphql_clients.py schema URL SDL_FILE
      the full introspection query (descriptions, specifiedByURL, isRepeatable, the schema's
      description, deprecated arguments and input fields) → build_client_schema → print_schema,
      beside print_schema(build_schema(SDL)): {"introspected": TEXT, "sdl": TEXT}.
  python graphql_clients.py run URL QUERY_FILE [VARIABLES_JSON [OPERATION]]
      `gql`'s client (the schema fetched from the route by introspection, every operation
      validated against it before it is sent): {"data": DATA} or, when the route answers with
      errors, {"errors": ERRORS, "data": DATA_OR_NULL}.
"""

import json
import sys
import urllib.request

from graphql import (
    build_client_schema,
    build_schema,
    get_introspection_query,
    print_schema,
)

TIMEOUT = 30


def post(url, body):
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={
            "content-type": "application/json",
            "accept": "application/graphql-response+json, application/json",
        },
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
        return json.loads(r.read())


def schema(url, sdl_file):
    query = get_introspection_query(
        descriptions=True,
        specified_by_url=True,
        directive_is_repeatable=True,
        schema_description=True,
        input_value_deprecation=True,
    )
    answer = post(url, {"query": query})
    if answer.get("errors"):
        print(json.dumps({"introspection_errors": answer["errors"]}))
        return
    introspected = print_schema(build_client_schema(answer["data"]))
    with open(sdl_file) as f:
        sdl = print_schema(build_schema(f.read()))
    print(json.dumps({"introspected": introspected, "sdl": sdl}))


def run(url, query_file, variables=None, operation=None):
    from gql import Client, gql
    from gql.transport.exceptions import TransportQueryError
    from gql.transport.requests import RequestsHTTPTransport

    with open(query_file) as f:
        text = f.read()
    transport = RequestsHTTPTransport(url=url, timeout=TIMEOUT, retries=0)
    client = Client(
        transport=transport,
        fetch_schema_from_transport=True,
        execute_timeout=TIMEOUT,
    )
    request = gql(text)
    if variables:
        request.variable_values = json.loads(variables)
    if operation:
        request.operation_name = operation
    with client as session:
        try:
            data = session.execute(request)
            print(json.dumps({"data": data}))
        except TransportQueryError as e:
            print(json.dumps({"errors": e.errors, "data": e.data}))


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    {"schema": schema, "run": run}[mode](*args)
