-- Read-only view of fingerprints over the live generations (contract: service/index/base.py).
-- KEYS shard bases, in the order of their records (one per call on a Redis Cluster).
-- ARGV[1] current generation; ARGV[2] generations to read;
-- ARGV[3] common: tenants with it in a prompt; ARGV[4] common: tenants with it at all;
-- ARGV[5] struct format of one record; ARGV[6] records per shard, one u32 big-endian per key;
-- ARGV[7] records, grouped by shard: position u32 (in the caller's array), bucket bytes, field
-- bytes (cut by the caller, as for insert.lua); ARGV[8] each record's bit in its shard's presence
-- filters, decimal, space-separated.
-- Keys, filters and stored values as in insert.lua. Returns one string of 17-byte rows, big-endian:
-- position u32, tenant u32, doc u32, offset u32, kinds u8; one row per entry of each fingerprint
-- that has entries, or one row with kinds 0 when it is common. (A string, not a list of integers:
-- it is what the caller decodes fastest.)

local cur = tonumber(ARGV[1])
local gens = tonumber(ARGV[2])
local common_prompt = tonumber(ARGV[3])
local common_any = tonumber(ARGV[4])
local format = ARGV[5]
local records = ARGV[7]
local bit_offsets, nbits = {}, 0
for w in string.gmatch(ARGV[8], '%d+') do nbits = nbits + 1; bit_offsets[nbits] = w end
local PROMPT, RESPONSE = 1, 2
local CHUNK = 1000
local byte, floor = string.byte, math.floor
local sunpack, spack = struct.unpack, struct.pack
local band, bor = bit.band, bit.bor
local first_gen = cur - gens + 1

-- BITFIELD_RO arguments for the bits at offsets[lo..hi], in chunks (Lua's unpack has a C stack
-- limit); the same arguments read every generation's filter.
local function bit_reads(lo, hi)
  local chunks = {}
  for first = lo, hi, CHUNK do
    local args, a = {}, 0
    for r = first, math.min(hi, first + CHUNK - 1) do
      args[a + 1] = 'GET'; args[a + 2] = 'u1'; args[a + 3] = bit_offsets[r]
      a = a + 3
    end
    chunks[#chunks + 1] = args
  end
  return chunks
end

local function read_bits(key, chunks)
  if #chunks == 1 then return redis.call('BITFIELD_RO', key, unpack(chunks[1])) end
  local out, n = {}, 0
  for _, args in ipairs(chunks) do
    for _, b in ipairs(redis.call('BITFIELD_RO', key, unpack(args))) do n = n + 1; out[n] = b end
  end
  return out
end

local out, rows = {}, 0
local at, r = 1, 0
for s, base in ipairs(KEYS) do
  local count = sunpack('>I4', ARGV[6], 4 * s - 3)
  local gen_base, present, reads = {}, {}, bit_reads(r + 1, r + count)
  for gen = first_gen, cur do
    gen_base[gen] = base .. ':' .. gen .. ':'
    present[gen] = read_bits(base .. ':f:' .. gen, reads)
  end
  for i = 1, count do
    r = r + 1
    local pos, bucket, field, next_at = sunpack(format, records, at)
    at = next_at
    local merged, tenants, common = {}, {}, false
    for gen = first_gen, cur do
      local value = nil
      if present[gen][i] == 1 then value = redis.call('HGET', gen_base[gen] .. bucket, field) end
      if value == '*' then common = true break end
      if value then
        local j, n = 1, #value
        while j <= n do
          local x, m, b = 0, 1, 128
          while b >= 128 do
            b = byte(value, j); j = j + 1; x = x + (b % 128) * m; m = m * 128
          end
          local d = sunpack('>I4', value, j)
          j = j + 4
          local o
          o, m, b = 0, 1, 128
          while b >= 128 do
            b = byte(value, j); j = j + 1; o = o + (b % 128) * m; m = m * 128
          end
          local t, k = floor(x / 4), x % 4
          local e = merged[t]
          if e then
            if e[3] == RESPONSE and band(k, PROMPT) == PROMPT then e[1] = d; e[2] = o end
            e[3] = bor(e[3], k)
          else
            merged[t] = {d, o, k}; tenants[#tenants + 1] = t
          end
        end
      end
    end
    local senders = 0
    for _, t in ipairs(tenants) do
      if band(merged[t][3], PROMPT) == PROMPT then senders = senders + 1 end
    end
    if common or senders >= common_prompt or #tenants >= common_any then
      rows = rows + 1
      out[rows] = spack('>I4I4I4I4B', pos, 0, 0, 0, 0)
    else
      for _, t in ipairs(tenants) do
        local e = merged[t]
        rows = rows + 1
        out[rows] = spack('>I4I4I4I4B', pos, t, e[1], e[2], e[3])
      end
    end
  end
end
return table.concat(out)
