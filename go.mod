module github.com/mwrpc/mwrpc

go 1.26

require github.com/panjf2000/ants/v2 v2.12.1

require golang.org/x/sync v0.11.0 // indirect
