"""The guest's side of the door: its connections arrive as SSH channels (doorway), bytes are pumped between them
and local sockets with no thread per connection (pump), and published ports go the other way (published)."""
