module github.com/mwrpc/mwrpc

go 1.26.0

require (
	github.com/panjf2000/ants/v2 v2.12.1
	github.com/vmihailenco/msgpack/v5 v5.4.1
	golang.org/x/tools v0.52.0
)

require (
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
	golang.org/x/mod v0.42.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
)
