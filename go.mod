module github.com/mwrpc/mwrpc

go 1.26

require (
	github.com/panjf2000/ants/v2 v2.12.1
	github.com/vmihailenco/msgpack/v5 v5.4.1
)

require (
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
	golang.org/x/sync v0.11.0 // indirect
)
