"""The control protocol between a Node agent and the node gateway, shared by both sides.

HTTP:
  POST {ENROLL_PATH}   {"token", "name", "hostname"} -> {"node_id", "node", "fleet", "credential"}
  GET  {CONTROL_PATH}  WebSocket upgrade, `Authorization: Bearer <node credential>`
  POST {REPORTS_PATH}  {"epoch", "kind", "payload"} with the credential: a report outside the socket
  GET  {FILES_PATH}<kind>/<name>  files for agents (capsules; providers in app.node_gateway.files)

WebSocket messages are JSON objects with a "type":
  gateway -> agent: hello, command, rotate_credential, report_result, error
  agent -> gateway: heartbeat, ack, report, credential_saved
A refused credential gets one `error` message {"status", "message"} and a close code 4000 + status.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

ENROLL_PATH = "/v1/enroll"
CONTROL_PATH = "/v1/control"
REPORTS_PATH = "/v1/reports"
FILES_PATH = "/v1/files/"
HEALTH_PATH = "/healthz"
STATS_PATH = "/v1/stats"  # the counters, to a loopback peer only (the bench, an operator on the host)

# Secrets' prefixes make a leaked string recognizable in logs and scanners.
CREDENTIAL_PREFIX = "tpn"
ENROLL_TOKEN_PREFIX = "tpe"

CLOSE_REFUSED_BASE = 4000


class EnrollRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str = Field(min_length=1, max_length=200)
    name: str = Field(min_length=1, max_length=63)
    hostname: str | None = Field(default=None, max_length=255)


class EnrollResponse(BaseModel):
    node_id: int
    node: str
    fleet: str
    credential: str


class Heartbeat(BaseModel):
    type: Literal["heartbeat"]
    # What the agent is running (member ids and states); the launch issue reconciles against it.
    running: list[dict[str, Any]] = Field(default_factory=list)


class Ack(BaseModel):
    type: Literal["ack"]
    id: int
    result: dict[str, Any] | None = None
    error: str | None = None


class Report(BaseModel):
    type: Literal["report"]
    ref: int
    kind: str = Field(min_length=1, max_length=63)
    payload: dict[str, Any] = Field(default_factory=dict)


class CredentialSaved(BaseModel):
    type: Literal["credential_saved"]
    credential_id: int


AgentMessage = TypeAdapter(Annotated[Heartbeat | Ack | Report | CredentialSaved, Field(discriminator="type")])


class HttpReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    epoch: int
    kind: str = Field(min_length=1, max_length=63)
    payload: dict[str, Any] = Field(default_factory=dict)
