// Command goproxy is the plain Go io.Copy TCP proxy that the benchmark compares against.
package main

import (
	"flag"
	"io"
	"log"
	"net"
)

// relay copies src to dst, then half-closes dst so the peer sees end of stream.
// On Linux, io.Copy between two *net.TCPConn uses splice(2) through TCPConn.ReadFrom.
func relay(dst, src *net.TCPConn, done chan<- struct{}) {
	_, _ = io.Copy(dst, src)
	_ = dst.CloseWrite()
	done <- struct{}{}
}

func serve(client *net.TCPConn, upstream string) {
	defer client.Close()
	conn, err := net.Dial("tcp", upstream)
	if err != nil {
		return
	}
	origin := conn.(*net.TCPConn)
	defer origin.Close()
	done := make(chan struct{}, 2)
	go relay(origin, client, done)
	go relay(client, origin, done)
	<-done
	<-done
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to accept on")
	upstream := flag.String("upstream", "", "address to forward to")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("listening on %s -> %s", ln.Addr(), *upstream)
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Print(err)
			continue
		}
		go serve(c.(*net.TCPConn), *upstream)
	}
}
