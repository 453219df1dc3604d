-- Shared by insert.lua and lookup.lua: redis_index.py puts this file in front of each of them,
-- since a Redis script cannot load another. Layout and entry encoding: service/index/keys.py.
--
-- Stored value per field: '*' once common, else entries of
--          varint(tenant * 4 + kinds) . doc u32 big-endian . varint(offset)
-- (kinds: 1 prompt, 2 response; varint: 7 bits a byte, low first, high bit = more follows).

local byte, char, sub, floor, rep = string.byte, string.char, string.sub, math.floor, string.rep
local spack, sunpack = struct.pack, struct.unpack
local band, bor = bit.band, bit.bor
local PROMPT, RESPONSE, COMMON = 1, 2, '*'
local CHUNK = 1000  -- BITFIELD subcommands per call: Lua's unpack has a C stack limit
-- A shard's filters are read whole (GETRANGE of the span its records fall in) when that costs at
-- most this many bytes a record, else bit by bit (BITFIELD_RO): small batches, many buckets.
-- Whole, a call saves the decoding of three arguments per record and generation, and a bucket's
-- TTL is set once, when it is created; but it copies the span, and its write (SETRANGE) goes to
-- the AOF and the replicas as bytes, so the span must stay a small multiple of the records.
local SPAN_BYTES_PER_RECORD = 256

-- Calls fn(tenant, doc, offset, kinds, first byte, byte after) for each entry of a stored value,
-- until fn returns true.
local function each(value, fn)
  local i, n = 1, #value
  while i <= n do
    local start, x, m, b = i, 0, 1, 128
    while b >= 128 do
      b = byte(value, i); i = i + 1; x = x + (b % 128) * m; m = m * 128
    end
    local d = sunpack('>I4', value, i)
    i = i + 4
    local o
    o, m, b = 0, 1, 128
    while b >= 128 do
      b = byte(value, i); i = i + 1; o = o + (b % 128) * m; m = m * 128
    end
    if fn(floor(x / 4), d, o, x % 4, start, i) then return end
  end
end

-- Fold entry (d, o, k) into e = {doc, offset, kinds}: kinds add up; a prompt doc replaces a
-- response-only one.
local function fold(e, d, o, k)
  if e[3] == RESPONSE and band(k, PROMPT) == PROMPT then e[1] = d; e[2] = o end
  e[3] = bor(e[3], k)
end

-- Each record's bit in its shard's presence filters, from decimal text (redis.call takes it as is).
local function parse_bits(text)
  local out, n = {}, 0
  for w in string.gmatch(text, '%d+') do n = n + 1; out[n] = w end
  return out
end

-- Where the records bits[first..first + count - 1] of one shard fall in its presence filters:
-- each one's byte (0-based), and the span of bytes to read whole, from the first byte of the
-- lowest record's bucket to the last byte of the highest's, with each one's bit mask in its byte;
-- no span (nor masks) when the records are too sparse for that (SPAN_BYTES_PER_RECORD).
local BIT_MASKS = {[0] = 128, 64, 32, 16, 8, 4, 2, 1}  -- Redis counts a byte's bits from its top

local function filter_positions(bits, first, count, bucket_bytes)
  local pos, lo, hi = {}, math.huge, -1
  for i = 1, count do
    local p = floor(tonumber(bits[first + i - 1]) / 8)
    pos[i] = p
    if p < lo then lo = p end
    if p > hi then hi = p end
  end
  lo = lo - lo % bucket_bytes
  hi = hi - hi % bucket_bytes + bucket_bytes - 1
  if hi - lo + 1 > SPAN_BYTES_PER_RECORD * count then return pos, nil, nil, nil end
  local mask = {}
  for i = 1, count do mask[i] = BIT_MASKS[tonumber(bits[first + i - 1]) % 8] end
  return pos, mask, lo, hi
end

-- Whether each record's bit is set in one filter (a list of 1 and 0), from one GETRANGE of the
-- span, or else from BITFIELD_RO. A missing filter reads as zeros. Also returns the span read
-- ('' when the filter is missing), nil without a span.
local function filter_read(key, bits, first, pos, mask, lo, hi)
  local count, out = #pos, {}
  if lo then
    local span = redis.call('GETRANGE', key, lo, hi)
    if span == '' then
      for i = 1, count do out[i] = 0 end
    else
      for i = 1, count do out[i] = band(byte(span, pos[i] - lo + 1), mask[i]) ~= 0 and 1 or 0 end
    end
    return out, span
  end
  for from = 1, count, CHUNK do
    local args, a = {}, 0
    for i = from, math.min(count, from + CHUNK - 1) do
      args[a + 1] = 'GET'; args[a + 2] = 'u1'; args[a + 3] = bits[first + i - 1]
      a = a + 3
    end
    for _, v in ipairs(redis.call('BITFIELD_RO', key, unpack(args))) do out[#out + 1] = v end
  end
  return out, nil
end
