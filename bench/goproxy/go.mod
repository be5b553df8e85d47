// Go module of the plain io.Copy TCP proxy that bench/ runs as a peer (no dependencies).
module sluice.bench/goproxy

go 1.21
