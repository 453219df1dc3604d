-- Read-only view of fingerprints over the live generations (contract: service/index/base.py).
-- KEYS[1] shard base; ARGV[1] current generation; ARGV[2] generations to read;
-- ARGV[3] common: tenants with it in a prompt; ARGV[4] common: tenants with it at all;
-- ARGV[5] struct format of one record, ARGV[6] its size; ARGV[7] records: position u32 (in the
-- caller's array), bucket bytes, field bytes (cut by the caller, as for insert.lua);
-- ARGV[8], ARGV[9], ...: each record's bit in the presence filters, as a decimal string.
-- Keys, filters and stored values as in insert.lua. Returns, per fingerprint that has entries:
-- position, entry count (-1 when common), then four integers per entry: tenant, doc, offset, kinds.

local base = KEYS[1]
local cur = tonumber(ARGV[1])
local gens = tonumber(ARGV[2])
local common_prompt = tonumber(ARGV[3])
local common_any = tonumber(ARGV[4])
local format = ARGV[5]
local size = tonumber(ARGV[6])
local records = ARGV[7]
local FIRST_BIT_ARG = 8
local count = #records / size
local PROMPT, RESPONSE = 1, 2
local CHUNK = 1000
local byte, floor = string.byte, math.floor
local sunpack = struct.unpack
local band, bor = bit.band, bit.bor

local gen_base, present = {}, {}
for gen = cur - gens + 1, cur do
  gen_base[gen] = base .. ':' .. gen .. ':'
  local bits = {}
  for first = 0, count - 1, CHUNK do
    local args = {}
    for r = first, math.min(count, first + CHUNK) - 1 do
      local n = #args
      args[n + 1] = 'GET'; args[n + 2] = 'u1'; args[n + 3] = ARGV[FIRST_BIT_ARG + r]
    end
    local got = redis.call('BITFIELD_RO', base .. ':f:' .. gen, unpack(args))
    for i = 1, #got do bits[first + i] = got[i] end
  end
  present[gen] = bits
end

local out = {}
for r = 1, count do
  local pos, bucket, field = sunpack(format, records, (r - 1) * size + 1)
  local merged, tenants, common = {}, {}, false
  for gen = cur - gens + 1, cur do
    local value = nil
    if present[gen][r] == 1 then value = redis.call('HGET', gen_base[gen] .. bucket, field) end
    if value == '*' then common = true break end
    if value then
      local i, n = 1, #value
      while i <= n do
        local x, m, b = 0, 1, 128
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
    out[#out + 1] = pos
    out[#out + 1] = -1
  elseif #tenants > 0 then
    out[#out + 1] = pos
    out[#out + 1] = #tenants
    for _, t in ipairs(tenants) do
      local e = merged[t]
      out[#out + 1] = t
      out[#out + 1] = e[1]
      out[#out + 1] = e[2]
      out[#out + 1] = e[3]
    end
  end
end
return out
