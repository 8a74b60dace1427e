package scenarios

import (
	"regexp"
	"strconv"
	"time"
)

var pingRTT = regexp.MustCompile(`time=([0-9.]+) ms`)

func parsePing(out string) []time.Duration {
	var rtts []time.Duration
	for _, m := range pingRTT.FindAllStringSubmatch(out, -1) {
		ms, err := strconv.ParseFloat(m[1], 64)
		if err == nil {
			rtts = append(rtts, time.Duration(ms*float64(time.Millisecond)))
		}
	}
	return rtts
}
