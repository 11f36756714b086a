module github.com/mwrpc/mwrpc

go 1.26
