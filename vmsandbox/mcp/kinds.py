"""What the tools' arguments and effects are called, for a model and for a client (their schema's descriptions
and the hints a client reads), shared by server.py and propose.py."""

from typing import Annotated

from mcp_types import ToolAnnotations
from pydantic import Field

Session = Annotated[str, Field(description="the session's name, as create_session or list_sessions gave it")]
InGuest = Annotated[str, Field(description="a path in the VM: absolute, or relative to the project directory")]
READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
CHANGE = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
ENDS = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)
WRITES_HOST = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=True)  # (the project)
