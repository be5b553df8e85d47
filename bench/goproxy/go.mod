module sluice.bench/goproxy

go 1.21
