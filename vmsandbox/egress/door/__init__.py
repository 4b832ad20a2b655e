"""The guest's side of the door: its connections arrive as SSH channels (doorway.py), bytes are pumped between them and
local sockets with no thread per connection (pump.py), and published ports go the other way (published.py)."""
