"""The things acted on, each a noun with its verbs: `checkpoint create|ls|rm|restore`, `port ls|publish|rm`,
`policy allow|deny|ls|log`, `image build|ls|show|rm` (images and the blueprints they are built from),
`host ls|add|rm|setup|prepare`, `secret set|ls|rm|wipe`, `login add|ls|rm`, `config show|validate|schema|trust`, and
under config the noun `config trust add|ls|rm` (trust.py)."""
