-- Shared by insert.lua and lookup.lua: redis_index.py puts this file in front of each of them,
-- since a Redis script cannot load another. Layout and entry encoding: service/index/keys.py.
--
-- Stored value per field: '*' once common by senders, else entries of
--          varint(tenant * 8 + kinds) . doc u32 big-endian . varint(offset)
-- (kinds: 1 prompt, 2 response, 4 served first: in a prompt, but first in an answer; varint: 7
-- bits a byte, low first, high bit = more follows), or, once common only because many tenants
-- hold it, '(' followed by its senders' entries and a mark, varint(tenant * 8 + 6), for each
-- tenant served it while the value stays within HELD_VALUE_BYTES: a later judgment can then tell
-- one tenant's prompt leaked into many answers, and sent back by their chats, from public text,
-- in no more bytes than a listpack value (docs/capacity.md). Unambiguous: an entry's first byte mod 8 is
-- its kinds, never 0, and '(' is 40, so no entries value starts with it; an entry is at least 6
-- bytes, so no entries value is '*'.

local byte, char, sub, floor = string.byte, string.char, string.sub, math.floor
local spack, sunpack = struct.pack, struct.unpack
local band, bor = bit.band, bit.bor
local PROMPT, RESPONSE, SERVED_FIRST, COMMON = 1, 2, 4, '*'
local MARK = 6  -- the kinds of a served mark: a tenant without doc or offset, in a HELD value only
local HELD, HELD_BYTE = '(', 40  -- common by holders: the senders' entries follow
local CHUNK = 1000  -- BITFIELD subcommands per call: Lua's unpack has a C stack limit

-- Each record's bit in its shard's presence filters, from decimal text: redis.call takes it as
-- is, where a Lua number would be turned into a string, which costs more than all the rest.
local function parse_bits(text)
  local out, n = {}, 0
  for w in string.gmatch(text, '%d+') do n = n + 1; out[n] = w end
  return out
end

-- Calls fn(tenant, doc, offset, kinds, first byte, byte after) for each entry of a stored value
-- from byte `from` on (2 past a HELD marker), until fn returns true; a mark has kinds MARK and no
-- doc or offset.
local function each(value, from, fn)
  local i, n = from, #value
  while i <= n do
    local start, x, m, b = i, 0, 1, 128
    while b >= 128 do
      b = byte(value, i); i = i + 1; x = x + (b % 128) * m; m = m * 128
    end
    local k, d, o = x % 8, nil, nil
    if k ~= MARK then
      d = sunpack('>I4', value, i)
      i = i + 4
      o, m, b = 0, 1, 128
      while b >= 128 do
        b = byte(value, i); i = i + 1; o = o + (b % 128) * m; m = m * 128
      end
    end
    if fn(floor(x / 8), d, o, k, start, i) then return end
  end
end

-- Whether an entry's tenant sent the text before it was served it: its first document is a prompt.
local function sends(k)
  return band(k, PROMPT + SERVED_FIRST) == PROMPT
end

-- Fold entry (d, o, k) into e = {doc, offset, kinds}: kinds add up; the doc is the tenant's first
-- holding the text, the lowest ref, not the first to arrive: on a Redis Cluster each node sees
-- batches in its own order, and refs are given at acceptance, so the same traffic leaves the
-- same entries whatever the topology or order. A prompt after an answer is a resend (SERVED_FIRST).
local function fold(e, d, o, k)
  local first = e[3]
  if d < e[1] then e[1] = d; e[2] = o; first = k end
  local bits = band(bor(e[3], k), PROMPT + RESPONSE)
  if band(bits, PROMPT) == PROMPT and not sends(first) then bits = bits + SERVED_FIRST end
  e[3] = bits
end

-- All of a value's entries from byte `from` on merged per tenant into `merged` (tenant -> {doc,
-- offset, kinds}), tenants in order of first appearance appended to `tenants`; marked tenants set
-- in `marked`.
local function merge(value, from, merged, tenants, marked)
  each(value, from, function(t, d, o, k)
    if k == MARK then marked[t] = true
    elseif merged[t] then fold(merged[t], d, o, k)
    else merged[t] = {d, o, k}; tenants[#tenants + 1] = t end
  end)
end

-- A stored value that is not '*' merged as above: its entries, or a held value's after its first
-- byte; whether it was held.
local function merge_stored(value, merged, tenants, marked)
  if byte(value) == HELD_BYTE then
    merge(value, 2, merged, tenants, marked)
    return true
  end
  merge(value, 1, merged, tenants, marked)
  return false
end

-- BITFIELD_RO arguments reading the bits bits[lo..hi], in chunks; every generation's filter is
-- read with the same arguments.
local function bit_reads(bits, lo, hi)
  local chunks = {}
  for first = lo, hi, CHUNK do
    local args, a = {}, 0
    for r = first, math.min(hi, first + CHUNK - 1) do
      args[a + 1] = 'GET'; args[a + 2] = 'u1'; args[a + 3] = bits[r]
      a = a + 3
    end
    chunks[#chunks + 1] = args
  end
  return chunks
end

-- The bits bit_reads asked for, of one filter, as one list of 1 and 0 (a missing filter reads 0).
local function read_bits(key, chunks)
  if #chunks == 1 then return redis.call('BITFIELD_RO', key, unpack(chunks[1])) end
  local out, n = {}, 0
  for _, args in ipairs(chunks) do
    for _, b in ipairs(redis.call('BITFIELD_RO', key, unpack(args))) do n = n + 1; out[n] = b end
  end
  return out
end
